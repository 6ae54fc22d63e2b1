// Command worker is a pgqueue worker: it claims messages (the claim waits server-side until
// some arrive), handles them one by one, acks each, and nacks with the error text when the
// handler fails. On SIGTERM or SIGINT it stops claiming and gives back (nack for now) what it
// has not handled yet.
//
//	DATABASE_URL=postgresql://app@localhost/app worker [queue]
//
// Optional: BATCH (messages per claim, default 10), WAIT_SECONDS (per claim, default 30).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"github.com/lib/pq"
)

const (
	claimSQL = `SELECT msg_id, claim_token, attempt, payload
	              FROM pgqueue.pgq_claim(queue => $1::text, qty => $2::int,
	                                     wait => make_interval(secs => $3::int))`
	ackSQL  = `SELECT pgqueue.pgq_ack(msg_id => $1::bigint, claim_token => $2::uuid)`
	nackSQL = `SELECT pgqueue.pgq_nack(msg_id => $1::bigint, claim_token => $2::uuid,
	                                   retry_in => $3::interval, error => $4::text)`
)

type message struct {
	ID      int64
	Token   string
	Attempt int
	Payload json.RawMessage
}

// handle is your job. An error nacks the message: it comes back after a backoff, and goes to
// dead letter after the queue's max_attempts. Keep jobs shorter than the queue's lease.
func handle(m message) error {
	var p struct {
		Fail bool `json:"fail"`
	}
	if err := json.Unmarshal(m.Payload, &p); err != nil {
		return err
	}
	if p.Fail {
		return errors.New("the payload asked to fail")
	}
	fmt.Printf("handled %d\n", m.ID)
	return nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("worker: ")
	queue := "jobs"
	if len(os.Args) > 1 {
		queue = os.Args[1]
	} else if q := os.Getenv("QUEUE"); q != "" {
		queue = q
	}
	batch, wait := intEnv("BATCH", 10), intEnv("WAIT_SECONDS", 30)

	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	// One session for claims and acks; the pool opens another to cancel a waiting claim.
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	var pid int
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex // guards stopping and claiming
	stopping, claiming := false, false
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-signals
		mu.Lock()
		defer mu.Unlock() // held until the cancel is sent: nothing else runs on conn meanwhile
		stopping = true
		if claiming {
			// End the waiting claim now instead of after its wait: a cancelled claim holds nothing.
			if _, err := db.Exec("SELECT pg_cancel_backend($1)", pid); err != nil {
				log.Printf("could not cancel the waiting claim (%v); it ends within its wait", err)
			}
		}
	}()
	isStopping := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stopping
	}

	for {
		mu.Lock()
		if stopping {
			mu.Unlock()
			break
		}
		claiming = true
		mu.Unlock()
		msgs, err := claim(ctx, conn, queue, batch, wait)
		mu.Lock()
		claiming = false
		mu.Unlock()
		var pqErr *pq.Error
		if err != nil && isStopping() && errors.As(err, &pqErr) && pqErr.Code == "57014" {
			break // our own cancel
		}
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range msgs {
			switch {
			case isStopping():
				finish(ctx, conn, "give back", m, nackSQL, m.ID, m.Token, "0", "worker stopped")
			default:
				if err := handle(m); err != nil {
					finish(ctx, conn, "nack", m, nackSQL, m.ID, m.Token, nil, err.Error())
				} else {
					finish(ctx, conn, "ack", m, ackSQL, m.ID, m.Token)
				}
			}
		}
	}
	fmt.Println("worker stopped")
}

func claim(ctx context.Context, conn *sql.Conn, queue string, batch, wait int) ([]message, error) {
	rows, err := conn.QueryContext(ctx, claimSQL, queue, batch, wait)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var msgs []message
	for rows.Next() {
		var m message
		if err := rows.Scan(&m.ID, &m.Token, &m.Attempt, &m.Payload); err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, rows.Err()
}

// finish runs an ack or nack. False means the claim was lost (its lease ended and the message
// was re-armed): nothing changed, and another worker may be handling it.
func finish(ctx context.Context, conn *sql.Conn, what string, m message, query string, args ...any) {
	var held bool
	if err := conn.QueryRowContext(ctx, query, args...).Scan(&held); err != nil {
		log.Fatalf("%s %d: %v", what, m.ID, err)
	}
	if !held {
		log.Printf("%s %d: claim lost, its work may be repeated", what, m.ID)
	}
}

func intEnv(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		log.Fatalf("%s must be a whole number, not %q", name, v)
	}
	return n
}
