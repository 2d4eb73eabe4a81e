module github.com/hangar-dev/hangar/sandbox-svc

go 1.26.8

replace (
	github.com/hangar-dev/hangar/api => ../api
	github.com/hangar-dev/hangar/platform => ../platform
)
