"""The one test hook: `ZOO_TEST_FAULT=<point>@<n>[:<m>]` kills a process at a chosen place (or, for `build-cpu`, changes
what a build computes), so the tests can show that the zoo recovers from it (real processes, real restarts). Unset, it
costs one environment lookup.

Points:
- `train-step@RANK:STEP`: training rank RANK dies before optimizer step STEP, on its first attempt only
  (torchrun `--max-restarts` then resumes it from the last checkpoint).
- `federated-client@CLIENT:ROUND`: federated client CLIENT dies mid-round ROUND (the server drops it).
- `federated-server@ROUND`: the federated server exits after completing round ROUND (a restart resumes it).
- `build-cpu@0`: not a kill: `zoo fetch --build` runs torch's kernels as a CPU without AVX would (zoo.store.build_on_miss),
  so the "rebuilt locally: differs" path can be shown on the card's own kind of machine.
"""

from __future__ import annotations

import os

ENV = "ZOO_TEST_FAULT"
EXIT_CODES = {"train-step": 13, "federated-client": 17, "federated-server": 19}


def armed(point: str) -> tuple[int, ...] | None:
    """The numbers after `point@` when ZOO_TEST_FAULT names this point, else None."""
    spec = os.environ.get(ENV, "")
    name, _, where = spec.partition("@")
    if name != point:
        return None
    return tuple(int(v) for v in where.split(":"))


def die(point: str, why: str) -> None:
    """Exit at once (no cleanup, like a crash), saying which hook fired."""
    print(f"{point}: {why} ({ENV})", flush=True)
    os._exit(EXIT_CODES[point])
