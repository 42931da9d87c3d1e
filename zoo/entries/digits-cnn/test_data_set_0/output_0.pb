version https://git-lfs.github.com/spec/v1
oid sha256:33c8c8715b345c0b604ab564fd0d21d5386fc6e4f5c9e711d05e5c42af1e5119
size 657
