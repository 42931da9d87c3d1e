version https://git-lfs.github.com/spec/v1
oid sha256:9c67d9f605df24907c6fd36475cbeeadd47fb31d3843283d38dcdee043dbbe9e
size 529
