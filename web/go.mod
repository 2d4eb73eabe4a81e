module github.com/hangar-dev/hangar/web

go 1.26.8

replace (
	github.com/hangar-dev/hangar/api => ../api
	github.com/hangar-dev/hangar/platform => ../platform
)

require (
	github.com/gorilla/websocket v1.5.3
	github.com/hangar-dev/hangar/api v0.0.0-00010101000000-000000000000
	github.com/hangar-dev/hangar/platform v0.0.0-00010101000000-000000000000
	google.golang.org/grpc v1.85.0
)

require (
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.33.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261026165753-2ffab32bce7e // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261104224025-d1e00e9f33ab // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
