version https://git-lfs.github.com/spec/v1
oid sha256:928b7947501c6419dd3864ed51d28c6753de19639d01bdbbc6e999546ef29504
size 657
