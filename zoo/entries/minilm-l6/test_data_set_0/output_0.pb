version https://git-lfs.github.com/spec/v1
oid sha256:10c2f2d8abafd72e7238001b81f7b4a6a3f991f01c0a2083555cdb1a20dcbeae
size 529
