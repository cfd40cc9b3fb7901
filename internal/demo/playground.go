package demo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/internal/pglocal"
)

// PlaygroundOptions are dam playground's settings.
type PlaygroundOptions struct {
	// Dir holds the playground: its dam.yaml (written when missing),
	// kcat.conf and the broker's data (kafka/, kept across restarts).
	Dir string
	// Listen is the broker's address, host:port. The broker tells its
	// clients to connect to it, so the host must be one they reach.
	Listen string
	// Config is the configuration whose routes' topics the broker holds
	// ("": Dir/dam.yaml, written when missing).
	Config string
	// Load reads a configuration file as dam run does.
	Load func(path string) (config.Config, error)
	// DSN is the PostgreSQL server that a written dam.yaml names ("": the
	// local one, DefaultDSN).
	DSN string
	// Partitions is the partition count of the topics the playground makes,
	// those of the configuration and those made on first use.
	Partitions int32
	// Yes: on a new broker, drop the configuration's schema even if the
	// playground did not make it.
	Yes bool
}

// DefaultDSN is the local PostgreSQL server as a package installs it, or as
// the tutorial starts it.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// PlaygroundSchema is the schema a dam.yaml written by the playground
// selects (its DSN's search_path).
const PlaygroundSchema = "dam_playground"

// playgroundMark is the comment the playground puts on the schema it makes.
const playgroundMark = "made by dam playground, which drops it and makes it again when its broker starts afresh"

// fileMark starts the first line of every file the playground writes.
const fileMark = "# Written by dam playground"

// ErrNotThePlaygrounds: the configuration's schema exists, was not made by
// dam playground, and the broker starts afresh without Yes.
var ErrNotThePlaygrounds = errors.New("demo: the configuration's schema exists and was not made by dam playground")

// ErrForeignConfig: Dir holds a dam.yaml that the playground did not write.
var ErrForeignConfig = errors.New("demo: dam.yaml exists and was not written by dam playground")

// ErrNoPostgres: no PostgreSQL server answers where a new dam.yaml would
// point; the error says how to get one.
var ErrNoPostgres = errors.New("demo: no PostgreSQL server answers")

// Playground runs dam playground until ctx ends: a Kafka broker (kfake) on
// o.Listen holding the topics of the configuration's routes (any other
// topic is made on first use), a dam.yaml for it, written when missing, and
// the commands to try next, printed to out.
func Playground(ctx context.Context, out io.Writer, o PlaygroundOptions) error {
	if o.Partitions < 1 {
		o.Partitions = 1
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	path, write, dsn := o.Config, false, ""
	if path == "" {
		path = filepath.Join(o.Dir, "dam.yaml")
		switch own, err := writtenByPlayground(path); {
		case errors.Is(err, fs.ErrNotExist):
			if dsn, err = playgroundPostgres(ctx, o.DSN); err != nil {
				return err
			}
			write = true
		case err != nil:
			return fmt.Errorf("demo: %w", err)
		case !own:
			return fmt.Errorf("%w: %s", ErrForeignConfig, path)
		}
	}

	dataDir := filepath.Join(o.Dir, "kafka")
	_, statErr := os.Stat(dataDir)
	fresh := errors.Is(statErr, fs.ErrNotExist)
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, o.Listen) }),
		kfake.DataDir(dataDir),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(int(o.Partitions)),
	)
	if err != nil {
		if fresh {
			_ = os.RemoveAll(dataDir)
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("demo: %s is in use (another playground, or a Kafka broker?): choose another address with --listen: %w", o.Listen, err)
		}
		return fmt.Errorf("demo: starting kfake: %w", err)
	}
	defer cluster.Close()
	fail := func(err error) error {
		if fresh {
			cluster.Close()
			_ = os.RemoveAll(dataDir)
		}
		return err
	}
	// Written once the broker listens, so that it names a broker that runs.
	if write {
		if err := writePlaygroundConfig(path, o.Listen, dsn); err != nil {
			return fail(err)
		}
	}
	cfg, err := o.Load(path)
	if err != nil {
		return fail(err)
	}
	// The schema is the playground's business only when the configuration
	// points at the playground: never touch a server that another one names.
	ours := slices.Contains(cfg.Kafka.Brokers, o.Listen)
	topics, err := makeTopics(cluster, cfg.Routes, o.Partitions)
	if err != nil {
		return fail(err)
	}
	schemaNote := "untouched: the configuration's kafka.brokers does not name " + o.Listen
	if ours {
		if schemaNote, err = prepareSchema(ctx, cfg.Postgres.DSN, fresh, o.Yes); err != nil {
			return fail(err)
		}
	}
	kcatConf := filepath.Join(o.Dir, "kcat.conf")
	kcatNote, err := writeKcatConf(kcatConf, o.Listen)
	if err != nil {
		return fail(err)
	}

	fmt.Fprintf(out, "dam playground: a Kafka broker (kfake) on %s until Ctrl-C\n", o.Listen)
	fmt.Fprintf(out, "  topics      %s (made with %d partition(s), as is any other topic on first use)\n", strings.Join(topics, ", "), o.Partitions)
	fmt.Fprintf(out, "  broker data %s (%s)\n", dataDir, map[bool]string{true: "new", false: "kept from the last run"}[fresh])
	fmt.Fprintf(out, "  config      %s (%s)\n", path, map[bool]string{true: "written now: edit it freely, it is never rewritten", false: "read"}[write])
	fmt.Fprintf(out, "  postgres    %s: %s\n", config.RedactDSN(cfg.Postgres.DSN), schemaNote)
	fmt.Fprintf(out, "  kcat        %s (%s)\n", kcatConf, kcatNote)
	if !ours {
		fmt.Fprintf(out, "warning: %s's kafka.brokers %v does not name this broker (%s): dam run would not reach it\n", path, cfg.Kafka.Brokers, o.Listen)
	}
	printNext(out, path, kcatConf, cfg, o.Partitions)
	<-ctx.Done()
	fmt.Fprintln(out, "dam playground: stopped; its topics and records are kept for the next start")
	return nil
}

// writtenByPlayground reports whether the file at path was written by the
// playground (its first line).
func writtenByPlayground(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	return strings.HasPrefix(line, fileMark), nil
}

// playgroundPostgres returns the DSN of the PostgreSQL server that a new
// dam.yaml names: dsn, or the local server, which must answer; otherwise
// the error says how to start one.
func playgroundPostgres(ctx context.Context, dsn string) (string, error) {
	if dsn == "" {
		dsn = DefaultDSN
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := pglocal.Reachable(rctx, dsn)
	cancel()
	if err != nil {
		return "", fmt.Errorf(`%w at %s (%v).
dam keeps its state in PostgreSQL. Start one, then run dam playground again:
  - in Docker: docker run -d --name dam-postgres -p 127.0.0.1:5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:17
  - or install it (Debian, Ubuntu: sudo apt-get install postgresql; macOS: brew install postgresql@17 && brew services start postgresql@17)
    and name a user it accepts: dam playground --dsn 'postgres://USER:PASSWORD@127.0.0.1:5432/postgres'`,
			ErrNoPostgres, config.RedactDSN(dsn), err)
	}
	return dsn, nil
}

// writePlaygroundConfig writes a new dam.yaml for the playground: its
// broker at listen, the PostgreSQL server at dsn in the schema
// PlaygroundSchema, a token for dam serve, and one route.
func writePlaygroundConfig(path, listen, dsn string) error {
	token := make([]byte, 24)
	if _, err := rand.Read(token); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `%s for its broker at %s. It is yours to edit:
# dam playground reads it at each start (it makes the topics its routes name)
# and never rewrites it. Every key: docs/configuration.md.
kafka:
  brokers: [%q]
  group: dam-playground
  # A new group reads what was produced before it first joined.
  start: earliest
postgres:
  # The schema dam_playground: dam migrate makes its tables.
  dsn: %q
http:
  # dam run's /metrics, /healthz and /readyz.
  listen: "127.0.0.1:9090"
serve:
  # dam serve's API; the token is this playground's own (curl -H "Authorization: Bearer TOKEN").
  listen: "127.0.0.1:8080"
  token: %q
log:
  format: console
routes:
  # An e-mail adapter's projections: a change of updated_at alone is no
  # reason to send an e-mail again.
  - service: emails
    from: projections.emails
    to: delivery.emails
    dead_letter: delivery.emails.dlq
    ignore: [/updated_at]
`, fileMark, listen, listen, withSearchPath(dsn, PlaygroundSchema), base64.RawURLEncoding.EncodeToString(token))
	// 0600: it holds a DSN and a token.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if _, err := f.Write(b.Bytes()); err != nil {
		f.Close()
		return fmt.Errorf("demo: %w", err)
	}
	return f.Close()
}

// makeTopics makes the topics that routes read and write, when missing,
// and returns their names.
func makeTopics(cluster *kfake.Cluster, routes []config.Route, partitions int32) ([]string, error) {
	var topics []string
	for _, r := range routes {
		for _, t := range []string{r.From, r.To, r.DeadLetter} {
			if t == "" || slices.Contains(topics, t) {
				continue
			}
			topics = append(topics, t)
			if cluster.TopicInfo(t) != nil {
				continue
			}
			if err := cluster.CreateTopic(t, partitions, nil); err != nil {
				return nil, fmt.Errorf("demo: making topic %s: %w", t, err)
			}
		}
	}
	return topics, nil
}

// prepareSchema makes the schema that dsn's search_path names, marked as
// the playground's, when missing; on a new broker (fresh) it drops it first,
// but only when the playground made it (or yes), since state and progress
// about another broker's records would make dam drop or halt. It says what
// it did.
func prepareSchema(ctx context.Context, dsn string, fresh, yes bool) (string, error) {
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("demo: postgres.dsn: %w", err)
	}
	name := pc.RuntimeParams["search_path"]
	if name == "" || strings.ContainsAny(name, `, "`) {
		return "its search_path names no one schema: the playground leaves the state alone", nil
	}
	s := ownedSchema{name: name, mark: playgroundMark, notOwn: ErrNotThePlaygrounds}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, pc)
	if err != nil {
		return "", fmt.Errorf("demo: PostgreSQL at %s does not answer: %w (start it, or point postgres.dsn elsewhere)", config.RedactDSN(dsn), err)
	}
	defer conn.Close(ctx)
	if !fresh {
		if err := s.ensure(cctx, conn); err != nil {
			return "", fmt.Errorf("demo: making schema %s: %w", name, err)
		}
		return "schema " + name + ", kept", nil
	}
	if err := s.remake(cctx, conn, yes); errors.Is(err, ErrNotThePlaygrounds) {
		return "", fmt.Errorf("%w: schema %s on %s holds state that this new broker's records would contradict; --yes drops it and everything in it",
			err, name, config.RedactDSN(dsn))
	} else if err != nil {
		return "", fmt.Errorf("demo: making schema %s: %w", name, err)
	}
	return "schema " + name + ", made afresh for the new broker (run dam migrate)", nil
}

// writeKcatConf writes kcat's configuration for the broker at addr, unless
// a file not written by the playground is in the way; it says which.
func writeKcatConf(path, addr string) (string, error) {
	own, err := writtenByPlayground(path)
	switch {
	case errors.Is(err, fs.ErrNotExist), err == nil && own:
	case err != nil:
		return "", fmt.Errorf("demo: %w", err)
	default:
		return "left alone: not written by dam playground", nil
	}
	body := fmt.Sprintf("%s at each start: kcat -F %s ...\nbootstrap.servers=%s\n", fileMark, filepath.Base(path), addr)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", fmt.Errorf("demo: %w", err)
	}
	return "kcat -F " + path, nil
}

// printNext prints the commands to try next against the first route.
func printNext(out io.Writer, path, kcatConf string, cfg config.Config, partitions int32) {
	if len(cfg.Routes) == 0 {
		return
	}
	r := cfg.Routes[0]
	c := " -c " + path
	where := "--partition 0 --offset 1"
	if partitions > 1 {
		where = "--partition P --offset 1  (P: the partition the consumer above printed for c-1)"
	}
	fmt.Fprintf(out, `
Next, in another terminal in this directory (docs/tutorial.md walks through them):
  dam migrate%[1]s                  # make dam's tables in the schema
  dam run%[1]s                      # the sidecar, until Ctrl-C
  printf '%%s\n' 'c-1:{"email":"ada@example.com","updated_at":1}' 'c-1:{"updated_at":2,"email":"ada@example.com"}' \
    | kcat -F %[2]s -P -t %[3]s -K:    # a record and its duplicate
  kcat -F %[2]s -C -t %[4]s -f '%%p %%o %%k %%s\n' -c 1    # what reached the adapter
  dam explain%[1]s --topic %[3]s %[5]s
  dam state get%[1]s %[6]s c-1
  dam serve%[1]s                    # the check service (token in %[7]s)
`, c, kcatConf, r.From, r.To, where, r.Service, path)
}
