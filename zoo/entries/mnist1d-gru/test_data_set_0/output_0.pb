version https://git-lfs.github.com/spec/v1
oid sha256:35329db1d15e7ad3689ed978e93e110e62d3e3c4aeb1a323f2071790937348c5
size 657
