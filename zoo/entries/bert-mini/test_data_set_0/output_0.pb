version https://git-lfs.github.com/spec/v1
oid sha256:3a11d3d62048507a9029b3bbc9807af6826b1eefbca5a0e447866fbf1d566211
size 529
