// A tiny typed event emitter (no Node `events` in the browser build).

export type Listener<T> = (arg: T) => void;

export class Emitter<Events extends object> {
  private listeners = new Map<keyof Events, Set<Listener<never>>>();

  /** Add a listener; returns a function that removes it. */
  on<K extends keyof Events>(event: K, fn: Listener<Events[K]>): () => void {
    let set = this.listeners.get(event);
    if (!set) {
      set = new Set();
      this.listeners.set(event, set);
    }
    set.add(fn as Listener<never>);
    return () => this.off(event, fn);
  }

  /** Add a listener that fires once. */
  once<K extends keyof Events>(event: K, fn: Listener<Events[K]>): () => void {
    const off = this.on(event, (arg) => {
      off();
      fn(arg);
    });
    return off;
  }

  off<K extends keyof Events>(event: K, fn: Listener<Events[K]>): void {
    this.listeners.get(event)?.delete(fn as Listener<never>);
  }

  protected listenerCount<K extends keyof Events>(event: K): number {
    return this.listeners.get(event)?.size ?? 0;
  }

  /**
   * Call every listener. A throwing listener must not break the SDK's bookkeeping half-way through a
   * frame, so its exception is caught and handed to `onListenerError`.
   */
  protected emit<K extends keyof Events>(event: K, arg: Events[K]): void {
    const set = this.listeners.get(event);
    if (!set || set.size === 0) return;
    for (const fn of [...set]) {
      try {
        (fn as Listener<Events[K]>)(arg);
      } catch (e) {
        this.onListenerError(event, e);
      }
    }
  }

  protected onListenerError(event: keyof Events, error: unknown): void {
    console.error(`Herald: a '${String(event)}' listener threw`, error);
  }
}
