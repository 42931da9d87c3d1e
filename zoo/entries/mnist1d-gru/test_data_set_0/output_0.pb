version https://git-lfs.github.com/spec/v1
oid sha256:a4ac8428a26804ef4b3f1955d2b663a80cc385e467c14ee9c281aaa875afa9f4
size 657
