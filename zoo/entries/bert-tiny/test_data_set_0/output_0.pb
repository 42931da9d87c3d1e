version https://git-lfs.github.com/spec/v1
oid sha256:099407e71758d5fc8579be4026fff865c077c009d91afcf262400c9d6fe1922d
size 529
