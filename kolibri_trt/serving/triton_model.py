"""Triton Inference Server Python-backend model for kolibri-trt (decoupled: streaming).

Copied into the model repository as `kolibri/1/model.py` by `kolibri-trt triton-repo` or
`build.py --triton-repo`. Thin on purpose: decode the request, hand it to the runtime, send
the responses; the logic is `kolibri_trt.serving.triton_frontend`, imported from the Python
environment that runs the backend stub (put the venv's `bin` first on PATH).
"""

import json

import triton_python_backend_utils as pb_utils

from kolibri_trt.serving.triton_frontend import TritonFrontEnd, error_kind
from kolibri_trt.serving.triton_repo import ModelOptions


class _Sender:
    """Triton's response sender in the shape `TritonFrontEnd` uses."""

    def __init__(self, request):
        self._sender = request.get_response_sender()
        self._request = request

    def send(self, outputs, error, final):
        if error is not None:
            code = getattr(pb_utils.TritonError, error_kind(error), None)
            err = (pb_utils.TritonError(str(error)) if code is None
                   else pb_utils.TritonError(str(error), code))
            response = pb_utils.InferenceResponse(error=err)
        elif outputs is not None:
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, array) for name, array in outputs.items()])
        else:
            response = None
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self._sender.send(response, flags=flags)

    def is_cancelled(self):
        check = getattr(self._request, "is_cancelled", None)
        return bool(check()) if check is not None else False


class TritonPythonModel:
    def initialize(self, args):
        options = ModelOptions.from_model_config(json.loads(args["model_config"]))
        self.front = TritonFrontEnd.start(options)  # one engine + EngineLoop per instance

    def execute(self, requests):
        for request in requests:
            sender = _Sender(request)

            def get_input(name, request=request):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()

            try:
                self.front.submit(get_input, sender)
            except Exception as exc:  # a bad request gets an error; the server stays up
                sender.send(None, exc, True)

    def finalize(self):
        self.front.close()
