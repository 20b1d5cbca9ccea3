// Package client is the Go client of kvtier serve's engine API
// (kvtier.engine.v1, api/enginev1; docs/engine-api.md): a session of one
// engine rank over a unix socket (or loopback TCP), the boot_id watch, and
// the slab mapping an engine copies through.
//
// A Client is not safe for concurrent use: one engine rank's scheduler
// owns it, and makes one Step call per scheduler step.
package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/pagehash"
)

// ErrRestarted means serve restarted (or ended the session): the client
// registered again; the caller forgets its pending lookups and plans and
// treats everything as a miss until new results come.
var ErrRestarted = errors.New("kvtier serve restarted or ended the session; registered again")

// ErrUnavailable means serve could not be reached; the next call
// registers again once it answers.
var ErrUnavailable = errors.New("kvtier serve unavailable")

// Options configure a Client.
type Options struct {
	// Socket is serve's unix socket path, or host:port for loopback TCP.
	Socket string
	// EngineID names the engine (logs, metrics).
	EngineID string
	// Rank and WorldSize place the engine rank in its group.
	Rank, WorldSize int
	// Namespace says what the KV bytes are (model, layout, dtype, page
	// geometry, shard, salt).
	Namespace *pb.Namespace
	// DialTimeout bounds Dial's Register (default 10 s).
	DialTimeout time.Duration
}

// Client is one engine rank's session with kvtier serve.
type Client struct {
	o    Options
	conn *grpc.ClientConn
	cl   pb.EngineClient
	info *pb.RegisterReply
	step uint64
	lost bool
}

// Dial connects to serve and registers the rank.
func Dial(ctx context.Context, o Options) (*Client, error) {
	if o.Socket == "" {
		return nil, fmt.Errorf("kvtier client: no socket")
	}
	if o.Namespace == nil {
		return nil, fmt.Errorf("kvtier client: no namespace")
	}
	if o.WorldSize <= 0 || o.Rank < 0 || o.Rank >= o.WorldSize {
		return nil, fmt.Errorf("kvtier client: rank %d of world size %d", o.Rank, o.WorldSize)
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	target := o.Socket
	if !strings.Contains(target, ":") || strings.HasPrefix(target, "/") || strings.HasPrefix(target, ".") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20)))
	if err != nil {
		return nil, fmt.Errorf("kvtier client: %s: %w", o.Socket, err)
	}
	c := &Client{o: o, conn: conn, cl: pb.NewEngineClient(conn)}
	rctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	if err := c.register(rctx, true); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// register opens a session; wait makes it wait for serve to listen.
func (c *Client) register(ctx context.Context, wait bool) error {
	ws := []uint32{1}
	reg, err := c.cl.Register(ctx, &pb.RegisterRequest{EngineId: c.o.EngineID, Rank: uint32(c.o.Rank), WorldSize: uint32(c.o.WorldSize),
		Namespace: c.o.Namespace, ProtocolVersions: ws}, grpc.WaitForReady(wait))
	if err != nil {
		if status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
			c.lost = true
			return fmt.Errorf("kvtier client: register rank %d: %w: %w", c.o.Rank, ErrUnavailable, err)
		}
		return fmt.Errorf("kvtier client: register rank %d: %w", c.o.Rank, err)
	}
	c.info, c.step, c.lost = reg, 0, false
	return nil
}

// Register opens a new session (after ErrRestarted or ErrUnavailable the
// client does it by itself on the next Step).
func (c *Client) Register(ctx context.Context) error { return c.register(ctx, false) }

// Info is the current session's RegisterReply: slab, kinds, limits.
func (c *Client) Info() *pb.RegisterReply { return c.info }

// Step sends one scheduler step. It fills session, boot_id and the step
// number. A step refused whole for its session or boot_id, or a reply
// from a serve with another boot_id, makes the client register again and
// return ErrRestarted; serve unreachable returns ErrUnavailable.
func (c *Client) Step(ctx context.Context, q *pb.StepRequest) (*pb.StepReply, error) {
	if c.lost {
		if err := c.register(ctx, false); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("kvtier client: %w", ErrRestarted)
	}
	c.step++
	q.Session, q.BootId, q.Step = c.info.GetSession(), c.info.GetBootId(), c.step
	out, err := c.cl.Step(ctx, q)
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			c.lost = true
			return nil, fmt.Errorf("kvtier client: step %d: %w: %w", c.step, ErrUnavailable, err)
		}
		return nil, fmt.Errorf("kvtier client: step %d: %w", c.step, err)
	}
	whole := len(out.GetErrors()) > 0 && (out.Errors[0].Item == "session" || out.Errors[0].Item == "boot_id")
	if out.GetBootId() != c.info.GetBootId() || whole {
		if err := c.register(ctx, false); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("kvtier client: step %d: %w", c.step, ErrRestarted)
	}
	return out, nil
}

// Ping makes the empty call.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.cl.Ping(ctx, &pb.PingRequest{})
	return err
}

// Health returns serve's health.
func (c *Client) Health(ctx context.Context) (*pb.HealthReply, error) {
	return c.cl.Health(ctx, &pb.HealthRequest{})
}

// Close ends the session (a session that already ended is not an error)
// and the connection.
func (c *Client) Close(ctx context.Context) error {
	var err error
	if c.info != nil && !c.lost {
		_, err = c.cl.Close(ctx, &pb.CloseRequest{Session: c.info.Session, BootId: c.info.BootId})
		if s := status.Code(err); s == codes.NotFound || s == codes.Unavailable || s == codes.FailedPrecondition {
			err = nil
		}
	}
	return errors.Join(err, c.conn.Close())
}

// PackHashes appends hs as pages x 32 bytes to dst.
func PackHashes(dst []byte, hs []pagehash.Hash) []byte {
	for _, h := range hs {
		dst = append(dst, h[:]...)
	}
	return dst
}

// Health asks the serve on socket for its health without a session
// (waiting for it to listen, bounded by ctx).
func Health(ctx context.Context, socket string) (*pb.HealthReply, error) {
	target := socket
	if !strings.Contains(target, ":") || strings.HasPrefix(target, "/") || strings.HasPrefix(target, ".") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("kvtier client: %s: %w", socket, err)
	}
	defer conn.Close()
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := pb.NewEngineClient(conn).Health(hctx, &pb.HealthRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("kvtier client: health of %s: %w", socket, err)
	}
	return h, nil
}
