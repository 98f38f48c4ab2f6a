module github.com/herald-rt/herald/clients/go

go 1.26

require (
	github.com/centrifugal/fdelta v0.0.3
	github.com/coder/websocket v1.8.15
)
