version https://git-lfs.github.com/spec/v1
oid sha256:e5f12e2492c97c0791cbb94d59f97c2c21c91bc3755d1d5960bee6c999869ae9
size 529
