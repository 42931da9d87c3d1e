version https://git-lfs.github.com/spec/v1
oid sha256:1d86ed1eeed69fd66a8caa5f682b4c23dfa297e2b6eee33665f4e73ee32aa19d
size 529
