"""Training from the ONNX file alone, with onnxruntime-training (no PyTorch code needed on the device).

- `trainable`: which initializers of an fp32 file a device may change (the file's `zoo.trainable` metadata).
- `engine`: onnxruntime-training artifacts made from an fp32 file (training, eval and optimizer models, checkpoint),
  packed as one deterministic zip, and `OnnxTrainer`, which runs them and exports a new inference model.
- `finetune`: `zoo finetune --onnx`, fine-tuning a fetched fp32 file on a user's data or a shifted dataset.
"""
