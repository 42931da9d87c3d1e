version https://git-lfs.github.com/spec/v1
oid sha256:e186043a677b19b3ceafe6942e859cbe001565b4d4995e2c6dda45d424940d4a
size 657
