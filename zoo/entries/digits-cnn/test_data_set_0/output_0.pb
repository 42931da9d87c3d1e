version https://git-lfs.github.com/spec/v1
oid sha256:89dd7e0d0cd9d8e29c67d75960ebee3aa8c55a972eb09b38b66797a183bfa34d
size 657
