version https://git-lfs.github.com/spec/v1
oid sha256:4b2c0fd1be6f1ec3d5ffdc65677ce5f791bfdca484cdf370dea0cfc123be2071
size 529
