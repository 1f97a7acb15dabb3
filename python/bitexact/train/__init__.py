"""``python -m bitexact.train``: `bitexact train`'s loop on a framework
binding's GLM-4.5 model (docs/train_python.md): _run (the loop, records,
checkpoints), _model (the model bodies shared by torch and Paddle), _data
(the token files; the data order and the synthetic corpus are the model
module's, bitexact._core.glm_*)."""
