version https://git-lfs.github.com/spec/v1
oid sha256:1b070a6b69b131a30205d1917ad4686205ded0b7159c6d755eaf77fa84c38fee
size 8208
