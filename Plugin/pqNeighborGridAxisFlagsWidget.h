// The properties panel's widget for a per-axis flag (Periodic): one check box per axis, x, y, z,
// each setting its own element of a 3-element IntVectorProperty. ParaView 5.11 shows such a
// property as three line edits, and with a BooleanDomain as one check box that sets element 0
// only (pqIntVectorPropertyWidget), so the panel needs this one. Scripts set the property as
// before: Periodic = [1, 0, 1]. Used by NeighborGrid.xml through panel_widget="neighborgrid_axis_flags".
#ifndef pqNeighborGridAxisFlagsWidget_h
#define pqNeighborGridAxisFlagsWidget_h

#include "pqPropertyWidget.h"

class pqNeighborGridAxisFlagsWidget : public pqPropertyWidget
{
  Q_OBJECT
  typedef pqPropertyWidget Superclass;

public:
  pqNeighborGridAxisFlagsWidget(vtkSMProxy* proxy, vtkSMProperty* property, QWidget* parent = nullptr);
  ~pqNeighborGridAxisFlagsWidget() override;

private:
  Q_DISABLE_COPY(pqNeighborGridAxisFlagsWidget)
};

#endif
