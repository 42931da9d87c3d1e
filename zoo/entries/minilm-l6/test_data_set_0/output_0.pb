version https://git-lfs.github.com/spec/v1
oid sha256:78f147bd58155e29137748c3b49a7ebb147e297843229b999161cb9b5ddd8aaf
size 529
