'use strict';
// A pgqueue worker: claims messages (the claim waits server-side until some arrive), handles
// them one by one, acks each, nacks with the error text when the handler throws. On SIGTERM
// or SIGINT it stops claiming and gives back (nack for now) what it has not handled yet.
//
//   DATABASE_URL=postgresql://app@localhost/app node worker.js [queue]
// Optional: BATCH (messages per claim, default 10), WAIT_SECONDS (per claim, default 30).
const { Client } = require('pg');

const queue = process.argv[2] || process.env.QUEUE || 'jobs';
const batch = Number(process.env.BATCH || 10);
const waitSeconds = Number(process.env.WAIT_SECONDS || 30);

// Your job goes here. Throwing nacks the message: it comes back after a backoff, and goes to
// dead letter after the queue's max_attempts. Keep jobs shorter than the queue's lease.
async function handle(message) {
  if (message.payload.fail) throw new Error('the payload asked to fail');
  console.log(`handled ${message.msg_id}`);
}

const CLAIM = `SELECT msg_id, claim_token, attempt, payload
                 FROM pgqueue.pgq_claim(queue => $1::text, qty => $2::int,
                                        wait => make_interval(secs => $3::int))`;
const ACK = 'SELECT pgqueue.pgq_ack(msg_id => $1::bigint, claim_token => $2::uuid) AS held';
const NACK = `SELECT pgqueue.pgq_nack(msg_id => $1::bigint, claim_token => $2::uuid,
                                      retry_in => $3::interval, error => $4::text) AS held`;

async function main() {
  const client = new Client({ connectionString: process.env.DATABASE_URL, application_name: 'pgqueue-node-worker' });
  // A lost connection ends the worker (exit 1): run it under a supervisor that restarts it.
  client.on('error', (err) => {
    console.error(`worker: connection lost: ${err.message}`);
    process.exit(1);
  });
  await client.connect();

  let stopping = false;
  let claiming = false;
  let cancelling = Promise.resolve();
  const stop = () => {
    if (stopping) return;
    stopping = true;
    if (claiming) cancelling = cancelClaim(client.processID);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);

  // A false from ack or nack: the claim was lost (the lease ended and the message was
  // re-armed): nothing changed, another worker may be handling it.
  const report = (what, msg, res) => {
    if (!res.rows[0].held) console.warn(`${what} ${msg.msg_id}: claim lost, its work may be repeated`);
  };

  while (!stopping) {
    let claimed;
    claiming = true;
    try {
      claimed = (await client.query(CLAIM, [queue, batch, waitSeconds])).rows;
    } catch (err) {
      if (stopping && err.code === '57014') break; // our own cancel
      throw err;
    } finally {
      claiming = false;
      // Sent before our next statement, a cancel can only have hit the claim (an idle
      // session ignores it).
      await cancelling;
    }
    for (const msg of claimed) {
      if (stopping) {
        report('give back', msg, await client.query(NACK, [msg.msg_id, msg.claim_token, '0', 'worker stopped']));
        continue;
      }
      try {
        await handle(msg);
      } catch (err) {
        report('nack', msg, await client.query(NACK, [msg.msg_id, msg.claim_token, null, String(err.message || err)]));
        continue;
      }
      report('ack', msg, await client.query(ACK, [msg.msg_id, msg.claim_token]));
    }
  }
  await client.end();
  console.log('worker stopped');
}

// Ends a waiting claim now instead of after its wait: a cancelled claim holds nothing.
async function cancelClaim(pid) {
  const other = new Client({ connectionString: process.env.DATABASE_URL });
  try {
    await other.connect();
    await other.query('SELECT pg_cancel_backend($1)', [pid]);
  } catch (err) {
    console.warn(`could not cancel the waiting claim (${err.message}); it ends within its wait`);
  } finally {
    await other.end();
  }
}

main().catch((err) => {
  console.error(`worker: ${err.message}${err.code ? ` (SQLSTATE ${err.code})` : ''}`);
  process.exit(1);
});
