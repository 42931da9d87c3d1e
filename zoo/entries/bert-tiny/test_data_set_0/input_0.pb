version https://git-lfs.github.com/spec/v1
oid sha256:76b85691db17fb391510e14c54e0c681b994413645736e16aa72deaa8fbed92d
size 8208
