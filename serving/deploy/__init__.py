"""Ray Serve deployment of the server: the one package that imports ray.

Modules: app (build({"config": PATH}), the application and Helm's import_path), replica
(ModelServer: one engine and the HTTP app in front of it), ingress (a replica serves a request
itself or forwards it to a peer), routing (routing ids and the ids a replica holds), router
(AdapterRouter: Ray's multiplexed routing, plus copying a hot adapter), arrivals (whether an
adapter was resident when its request arrived), exposure (the keys, and the rule that a keyless server serves loopback only), launch (`loraserve
serve`: a local Ray, or a given cluster, until a signal) and console (Ray's output to a log
file, ours to the terminal).
"""
