"""Past one server: Triton replicas behind an image-affine proxy.

- :mod:`triton_sam.scaleout.nginx`: the proxy's configuration (consistent hash of the
  routing header) rendered from one dataclass, for tests, compose and deploy/ alike.
- :mod:`triton_sam.scaleout.access`: who gets through it (bearer tokens, tenants, open health
  routes, refused admin APIs) and the tokens file.
- :mod:`triton_sam.scaleout.proxy`: a local nginx process running it, and its access log.
- :mod:`triton_sam.scaleout.replicas`: N embedded Triton replicas on one repository, and
  killing one of them as an orchestrator's failure would.
- ``triton_sam.bench.replicas``: concurrent sessions through the proxy with a replica killed
  mid-run (``triton-sam bench replicas``).

The routing key itself is chosen client side, in :mod:`triton_sam.client.routing`.
"""
