"""The layers under :class:`sdgruntime.client.Client`, one concept per module.

- :mod:`~sdgruntime.rest.config`: kubeconfig / in-cluster loading, TLS settings, and the
  credentials kept current by the configuration's refresh hook (exec plugins, token files).
- :mod:`~sdgruntime.rest.transport`: HTTP/1.1 (the pool, timeouts, metrics, JSON, typed
  errors for answers and for no answer).
- :mod:`~sdgruntime.rest.http1`: the request pool and watch streams (asyncio protocols,
  httptools' parser).
- :mod:`~sdgruntime.rest.retry`: which failed requests are replayed (tenacity), and how.
- :mod:`~sdgruntime.rest.watch`: watch streams (line-delimited JSON events).

Imports go one way: ``client`` -> ``watch`` -> ``transport`` -> ``http1`` -> ``retry``;
``transport`` -> ``config``.
"""
