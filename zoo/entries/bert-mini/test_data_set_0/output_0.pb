version https://git-lfs.github.com/spec/v1
oid sha256:5d9693d9b52729cc683b49b8ed48fbd790fb498efd81912bc3b6951165b6df1b
size 529
