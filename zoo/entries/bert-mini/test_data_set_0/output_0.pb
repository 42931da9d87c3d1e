version https://git-lfs.github.com/spec/v1
oid sha256:c15a99368914906a74023324c5ac670fbe1f687448e4d1f9617c93888355f34d
size 529
