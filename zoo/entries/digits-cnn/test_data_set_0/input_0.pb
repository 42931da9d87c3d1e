version https://git-lfs.github.com/spec/v1
oid sha256:f4d0564c44bf49d177e183fe69773b24bb474d845530238e5e479f615882d80b
size 4116
