version https://git-lfs.github.com/spec/v1
oid sha256:b55c103b0d33878e0230ed61b6e48b6822525f11fc0b3424340bdb75f1c74c85
size 657
