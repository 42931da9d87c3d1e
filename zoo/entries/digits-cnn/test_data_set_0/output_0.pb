version https://git-lfs.github.com/spec/v1
oid sha256:3e0a389bbf6c7a92ab1917c7d16ad652d6088874dda4ada77c094804484e504e
size 657
