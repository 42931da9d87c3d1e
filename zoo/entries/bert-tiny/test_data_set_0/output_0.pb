version https://git-lfs.github.com/spec/v1
oid sha256:be2e0edc8c28cd78934d313fc0db4668fa270caec747c0a6a7751f30b18cff70
size 529
