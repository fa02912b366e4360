// Latest-wins: at most one request in flight per lane (an object, or the hover preview) and
// at most one waiting. A newer job replaces the waiting one, which is never sent; when the
// request in flight answers, the waiting job starts. An answer is delivered unless a newer
// one was delivered before it (an older job's answer still shows while the newest is
// computed: the preview follows the cursor). So a storm of E hover events during a drag of
// T ms with round trips of D ms sends at most ceil(T / D) + 2 requests, not E.
//
// cancel() drops the waiting job and aborts the fetch in flight (its answer is ignored);
// dropWaiting() only drops the waiting job.
// Over HTTP, Triton runs a request it already holds to the end; the page aborts only when a
// click must not wait behind a hover.

export class Lane {
  /** @param run async (job, signal) => result;  @param deliver (result, job) => void */
  constructor(run, deliver, fail) {
    this.run = run;
    this.deliver = deliver;
    this.fail = fail;
    this.inflight = null; // {controller, generation}
    this.waiting = null; // {job, generation}
    this.generation = 0;
    this.shown = 0; // generation of the last answer delivered
    this.sent = 0;
  }

  get idle() {
    return this.inflight === null && this.waiting === null;
  }

  submit(job) {
    this.generation += 1;
    if (this.inflight) {
      this.waiting = { job, generation: this.generation };
    } else {
      this.start(job, this.generation);
    }
  }

  /** Forget the waiting job (never sent); the request in flight goes on. */
  dropWaiting() {
    this.waiting = null;
  }

  cancel() {
    this.generation += 1;
    this.waiting = null;
    if (this.inflight) {
      this.inflight.controller.abort();
      this.inflight = null;
    }
  }

  start(job, generation) {
    const controller = new AbortController();
    const mine = { controller, generation };
    this.inflight = mine;
    this.sent += 1;
    this.run(job, controller.signal)
      .then(
        (result) => {
          if (generation > this.shown && !controller.signal.aborted) {
            this.shown = generation;
            this.deliver(result, job);
          }
        },
        (error) => {
          if (error.name !== "AbortError" && generation > this.shown) this.fail(error, job);
        },
      )
      .finally(() => {
        if (this.inflight !== mine) return; // cancelled: a newer request owns the lane
        this.inflight = null;
        if (this.waiting) {
          const next = this.waiting;
          this.waiting = null;
          this.start(next.job, next.generation);
        }
      });
  }
}
