version https://git-lfs.github.com/spec/v1
oid sha256:c3cc33186cb78e9dcde07659e99dbbcae8da1a42730ad2368a09594bdef283b9
size 529
