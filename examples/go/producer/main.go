// Command producer sends COUNT messages to a pgqueue queue, in batches, each batch in a
// transaction of its own (where an application would also write the rows the jobs are about).
//
//	DATABASE_URL=postgresql://app@localhost/app producer [queue] [count]
package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/lib/pq"
)

const batchSize = 1000 // pgq_send_batch takes up to 10,000 payloads

func main() {
	log.SetFlags(0)
	log.SetPrefix("producer: ")
	queue := arg(1, "QUEUE", "jobs")
	count, err := strconv.Atoi(arg(2, "COUNT", "100"))
	if err != nil || count < 0 {
		log.Fatalf("count must be a whole number, not %q", arg(2, "COUNT", "100"))
	}
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	for sent := 0; sent < count; {
		var payloads []string
		for n := sent; n < count && n < sent+batchSize; n++ {
			p, _ := json.Marshal(map[string]any{"n": n, "at": time.Now().UTC()})
			payloads = append(payloads, string(p))
		}
		if err := sendBatch(db, queue, payloads); err != nil {
			log.Fatal(err)
		}
		sent += len(payloads)
	}
	fmt.Printf("sent %d messages to %s\n", count, queue)
}

// sendBatch enqueues payloads in one transaction: they become visible when it commits.
func sendBatch(db *sql.DB, queue string, payloads []string) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit: a no-op
	_, err = tx.Exec(`SELECT pgqueue.pgq_send_batch(queue => $1::text, payloads => $2::jsonb[])`,
		queue, pq.Array(payloads))
	if err != nil {
		return err
	}
	return tx.Commit()
}

// arg is the command-line argument i, else the environment variable env, else def.
func arg(i int, env, def string) string {
	if len(os.Args) > i {
		return os.Args[i]
	}
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}
