version https://git-lfs.github.com/spec/v1
oid sha256:febdee7bec1b84ccb955d0040f21b68d98acd50976b8337493cbaf97e2ab111e
size 529
