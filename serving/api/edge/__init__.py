"""The edge: what every request passes before a route: API keys, the gate, body limits, request ids."""
