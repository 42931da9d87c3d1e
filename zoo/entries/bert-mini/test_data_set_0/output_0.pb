version https://git-lfs.github.com/spec/v1
oid sha256:46499327d8d1de920b5d657a0560223db4054def9880b30a2af251253e414d8d
size 529
