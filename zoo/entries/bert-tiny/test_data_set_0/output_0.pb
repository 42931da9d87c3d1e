version https://git-lfs.github.com/spec/v1
oid sha256:d86ae0ae93db69ddda825251f306e3bca7487fa4767d2b96a1bc020f93296158
size 529
