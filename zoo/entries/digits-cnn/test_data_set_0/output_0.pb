version https://git-lfs.github.com/spec/v1
oid sha256:c8939a9b6fe3e00f993d86c80435ce64f59dcce38dc75a21002f76ef87026c40
size 657
