/**
 * A value that changes over time: read `value`, or `subscribe` to be called
 * with the current value at once and with every change after it (the shape
 * of a Svelte store, easy to adapt to React's `useSyncExternalStore`).
 */
export interface Observable<T> {
  readonly value: T;
  /** Calls `fn` now and on every change; returns the unsubscribe function. */
  subscribe(fn: (value: T) => void): () => void;
}

export class Value<T> implements Observable<T> {
  #value: T;
  #subscribers = new Set<(value: T) => void>();

  constructor(value: T) {
    this.#value = value;
  }

  get value(): T {
    return this.#value;
  }

  set(value: T): void {
    this.#value = value;
    for (const fn of [...this.#subscribers]) fn(value);
  }

  subscribe(fn: (value: T) => void): () => void {
    this.#subscribers.add(fn);
    fn(this.#value);
    return () => this.#subscribers.delete(fn);
  }
}

type Listener<A> = (arg: A) => void;

/** A small typed event emitter. A listener that throws does not stop the others. */
export class Emitter<Events extends object> {
  #listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Adds a listener; returns the function that removes it. */
  on<K extends keyof Events>(type: K, fn: Listener<Events[K]>): () => void {
    let set = this.#listeners.get(type);
    if (!set) this.#listeners.set(type, (set = new Set()));
    set.add(fn as Listener<never>);
    return () => this.off(type, fn);
  }

  off<K extends keyof Events>(type: K, fn: Listener<Events[K]>): void {
    this.#listeners.get(type)?.delete(fn as Listener<never>);
  }

  /** Whether anyone listens to `type`. */
  protected listens(type: keyof Events): boolean {
    return (this.#listeners.get(type)?.size ?? 0) > 0;
  }

  protected emit<K extends keyof Events>(type: K, arg: Events[K]): void {
    const set = this.#listeners.get(type);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<Events[K]>)(arg);
      } catch (e) {
        // A broken listener must not break delivery; surface it where the
        // platform reports uncaught errors.
        setTimeout(() => {
          throw e;
        });
      }
    }
  }
}
