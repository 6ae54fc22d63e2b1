'use strict';
// Sends COUNT messages to a pgqueue queue, in batches, each batch in a transaction of its
// own (where an application would also write the rows the jobs are about).
//
//   DATABASE_URL=postgresql://app@localhost/app node producer.js [queue] [count]
const { Client } = require('pg');

const queue = process.argv[2] || process.env.QUEUE || 'jobs';
const count = Number(process.argv[3] || process.env.COUNT || 100);
const BATCH = 1000; // pgq_send_batch takes up to 10,000 payloads

async function main() {
  if (!Number.isInteger(count) || count < 0) throw new Error(`count must be a whole number, not ${process.argv[3]}`);
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    let sent = 0;
    while (sent < count) {
      const payloads = [];
      for (let n = sent; n < Math.min(sent + BATCH, count); n++) payloads.push({ n, at: new Date().toISOString() });
      await client.query('BEGIN');
      // node-postgres sends a JS array as a PostgreSQL array; each element as JSON text.
      await client.query('SELECT pgqueue.pgq_send_batch(queue => $1::text, payloads => $2::jsonb[])', [
        queue,
        payloads.map((p) => JSON.stringify(p)),
      ]);
      await client.query('COMMIT');
      sent += payloads.length;
    }
    console.log(`sent ${sent} messages to ${queue}`);
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(`producer: ${err.message}${err.code ? ` (SQLSTATE ${err.code})` : ''}`);
  process.exit(1);
});
