version https://git-lfs.github.com/spec/v1
oid sha256:37b42bd9ad48010872a409dafc412ef7423fadf2c750b380f9d0a32f2e13523d
size 529
