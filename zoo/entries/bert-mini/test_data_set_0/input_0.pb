version https://git-lfs.github.com/spec/v1
oid sha256:525aa1268060d3240c6e8e1afe01af823822ae6a82991a5d8ee7d8bf4e6b199d
size 8208
