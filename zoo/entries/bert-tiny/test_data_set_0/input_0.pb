version https://git-lfs.github.com/spec/v1
oid sha256:80ba1b2a10bf1206f357e5b31362d6f5af759f58a3b6d2932804fb61af6de313
size 8208
