"""Ray Serve deployment of the server: the one package that imports ray.

Modules: app (build({"config": PATH}), the application and Helm's import_path), ingress
(the FastAPI app over RayGenerator), replica (ModelServer, one engine multiplexed by adapter
version), engine_setup (a replica's engine from the config, without ray), exposure (the
keys, and the rule that a keyless server serves loopback only) and launch (`loraserve
serve`: a local Ray, or a given cluster, until a signal).
"""
