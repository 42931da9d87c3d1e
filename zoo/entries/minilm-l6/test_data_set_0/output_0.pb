version https://git-lfs.github.com/spec/v1
oid sha256:93b31edea01c656ec60b9448412a9da1a4d1dee6ba946d779a3d8e67841e1551
size 529
