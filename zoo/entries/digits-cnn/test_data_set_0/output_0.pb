version https://git-lfs.github.com/spec/v1
oid sha256:e5c353568be4f9ada1ca77eaca1254bebcb9c38ad1bab1850fdafe8fccf57ec9
size 657
