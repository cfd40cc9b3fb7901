package pipeline_test

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// lossyListener wraps a kfake broker's listener: once armed for a request
// kind, the broker handles the next request of that kind, but its reply is
// dropped and the connection closed: the client cannot know the outcome
// (franz-go issues #1052, #1207: a transaction reported failed that did
// commit). Kafka frames: a 4-byte size, then for a request the api key,
// version and correlation id, for a response the correlation id.
type lossyListener struct {
	net.Listener
	f *lossyFaults
}

// lossyFaults is shared by the listeners of a cluster's brokers.
type lossyFaults struct {
	armed atomic.Int32 // the kmsg.Key to lose the reply of, +1; 0: none
	lost  atomic.Int32 // replies lost
}

func (f *lossyFaults) loseNext(key kmsg.Key) { f.armed.Store(int32(key) + 1) }

// listen is a kfake.ListenFn whose listeners lose replies as armed.
func (f *lossyFaults) listen(network, addr string) (net.Listener, error) {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyListener{Listener: ln, f: f}, nil
}

func (l *lossyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: l.f, drop: map[int32]bool{}}, nil
}

type lossyConn struct {
	net.Conn
	l    *lossyFaults
	mu   sync.Mutex
	in   []byte // requests read, not yet a whole frame
	out  []byte // responses written, not yet a whole frame
	drop map[int32]bool
}

func (c *lossyConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.in = append(c.in, b[:n]...)
	for len(c.in) >= 4 {
		size := int(binary.BigEndian.Uint32(c.in))
		if len(c.in) < 4+size {
			break
		}
		frame := c.in[4 : 4+size]
		if len(frame) >= 8 {
			key := int32(binary.BigEndian.Uint16(frame))
			if a := c.l.armed.Load(); a != 0 && a == key+1 && c.l.armed.CompareAndSwap(a, 0) {
				c.drop[int32(binary.BigEndian.Uint32(frame[4:]))] = true
			}
		}
		c.in = c.in[4+size:]
	}
	c.mu.Unlock()
	return n, err
}

func (c *lossyConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, b...)
	for len(c.out) >= 8 {
		size := int(binary.BigEndian.Uint32(c.out))
		if len(c.out) < 4+size {
			break
		}
		frame := c.out[:4+size]
		if c.drop[int32(binary.BigEndian.Uint32(frame[4:]))] {
			c.l.lost.Add(1)
			c.Conn.Close()
			return len(b), nil
		}
		if _, err := c.Conn.Write(frame); err != nil {
			return 0, err
		}
		c.out = c.out[4+size:]
	}
	return len(b), nil
}
