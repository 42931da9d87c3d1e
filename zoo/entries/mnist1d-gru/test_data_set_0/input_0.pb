version https://git-lfs.github.com/spec/v1
oid sha256:7d694ca6d25e1f34fbebd4117dd2a49d0003927b22746e3e82e48450b16de75e
size 2578
