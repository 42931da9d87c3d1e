version https://git-lfs.github.com/spec/v1
oid sha256:cf5f26e757fb7fa425885fa8a87857bdd1858aa2319e56b0cdfef26c874a6343
size 529
