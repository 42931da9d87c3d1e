version https://git-lfs.github.com/spec/v1
oid sha256:057104619b361ed2a0bccf5e80ac8aff05e0c82201dd4b8cf5efa8840cb89c77
size 657
