version https://git-lfs.github.com/spec/v1
oid sha256:ec1fe099f778f1a5925a4f1250afb6c3b3ebcd92bf6d7493f24b8979aefdc9c7
size 529
