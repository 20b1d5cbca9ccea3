package main

import (
	"google.golang.org/grpc/experimental"

	"github.com/kvtier/kvtier/internal/grpcbuf"
)

// NB: gRPC reads the default pool when it decodes and encodes every
// message (its proto codec takes no other), and allows changing it only
// at init, before any connection.
func init() { experimental.SetDefaultBufferPool(grpcbuf.Default) }
